"""dashboards package of llm-slo."""
