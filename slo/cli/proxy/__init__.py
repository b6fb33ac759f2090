"""`slo proxy`: the latency middleware in front of any OpenAI-compatible server (`command`); the
app one process serves (`app`), the uvicorn protocol that writes streamed pieces straight to
the client (`direct`), and `--workers N` (`workers`)."""
