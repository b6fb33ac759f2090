"""Build-time scripts, run from a checkout and never installed: they write `engine/bundled/`."""
