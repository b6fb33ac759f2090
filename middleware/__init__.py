"""middleware package of llm-slo."""
