"""The engine's client-facing error, shared by every room (server, engine, loading: a chat template's
own raise_exception): a message and the request field it is about, answered as a 400."""


class InvalidParam(ValueError):
    """A client-facing message and the request field it is about."""

    def __init__(self, message: str, param: str, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code
