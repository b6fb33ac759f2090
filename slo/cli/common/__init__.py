"""What the CLI's commands share: the flags several take (`flags`) and the latency middleware
built from theirs (`middleware`)."""
