"""What the CLI's commands share: the latency middleware built from their flags."""
