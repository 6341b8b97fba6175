"""Model providers: each reads its own wire and yields canonical events, then the turn's result."""
