"""Parts of ``scripts/bench_tokens.py``: the recorded model streams, the in-process stages, the
end-to-end runs through a service process."""
