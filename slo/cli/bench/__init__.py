"""`slo bench`: an OpenAI-compatible load generator that times each request at the client and
keeps the server's own timings next to them (see `slo.cli.bench.client` for the definitions)."""
