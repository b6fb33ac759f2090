"""`slo demo`: the one-command tour (`command`) and its two scenarios, a batch flood under each
scheduling policy (`overload`) and a prefill twice as slow (`regression`, its server in
`regression_server`)."""
