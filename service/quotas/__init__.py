"""Quota policy: what each owner (an API key) may use at once, per minute and per day.

:class:`~service.quotas.local.Quotas` counts in this process; :class:`~service.quotas.shared.SharedQuotas`
keeps the same counts for every instance in Redis. The core calls either as its ``RunGate``; the
edge (:mod:`service.transports.edge.quotas`) counts requests and answers refusals.
"""
