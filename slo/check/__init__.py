"""Judging records against the spec: the evaluator (`evaluate`), its SQL pushdown for
PostgreSQL and SQLite (`sql_check` and the counting, scan, rank and gap queries it runs),
DuckDB over JSONL results (`jsonl_duckdb`), Prometheus' histograms and counters
(`prometheus_source`), and per-tier summaries (`summary`)."""
