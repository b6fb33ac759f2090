"""One measured request, from the door to its report: its timeline and breakdown, the exchange
that watches its messages, the finished request as one object, and the reporter that settles it
once (span, metrics, live windows, record)."""
