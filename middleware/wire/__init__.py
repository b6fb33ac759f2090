"""The OpenAI wire format as the middleware reads it: the typed chunk, the parser of streams and
plain bodies, the middleware's side of a response (usage asked for, counts settled), and body
pieces written straight to the client's socket."""
