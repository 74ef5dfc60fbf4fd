"""OpenAI's Responses API (POST/GET/DELETE /v1/responses), translated onto the chat-completions pipeline.

A request becomes a chat body (request.py), runs through the same stage list as /v1/chat/completions
(keys, limits, both caches, cascades, accounting, metrics, routing), and the chat answer or chunk stream
is rendered back as a Response object (reply.py) or the Responses event stream (stream.py). Answers are
kept for `previous_response_id` and GET/DELETE in a store with a TTL (store.py).
"""
