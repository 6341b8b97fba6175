"""What every face stands on: keys, CORS and hosts, errors, inputs, admission, quotas at the door,
the context the faces see, and answering approvals."""
