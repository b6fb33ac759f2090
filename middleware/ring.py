"""The live windows' ring layout, one place for the windows (`middleware.live.windows`) and both
hot paths that add to them (`window_add`): a leaf, so the hot path can read it without
importing the live windows, which import the hot path."""

SLOTS_PER_WINDOW = 60
# The current, partly filled slot plus a full window.
NUM_SLOTS = SLOTS_PER_WINDOW + 1
