"""Prometheus metrics from the SLI catalog: the request metric set, the engine's series, the
headroom gauge, and the histograms and instruments they are made of."""
