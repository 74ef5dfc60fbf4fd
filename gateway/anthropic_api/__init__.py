"""Anthropic's Messages API (POST /v1/messages), translated onto the chat-completions pipeline.

The request becomes a chat body (request.py) and runs through the same stage list as /v1/chat/completions;
the chat answer or chunk stream comes back as a Message (reply.py) or Anthropic's event stream (stream.py).
Errors take Anthropic's shape: {"type": "error", "error": {"type", "message"}} (errors.py).
"""
