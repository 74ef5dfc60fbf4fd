"""The vocabulary every package of the gateway shares, and nothing else.

A leaf: it imports no other package of this project (the import contracts in pyproject.toml say so and
CI checks them). What lives here: the request context (`context`), the reply and its one end-of-reply
hook (`reply`), OpenAI-style errors (`errors`) and request checks (`validation`), model and deployment
config with prices (`models`), SSE framing (`sse`) and trace helpers for upstream calls (`tracing`).
"""
