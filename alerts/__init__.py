"""alerts package of llm-slo."""
