"""Model providers: each yields raw model stream events for its parser."""
