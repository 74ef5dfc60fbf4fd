"""Domain errors of the policy store; the admin API and CLI turn them into 404/409 answers."""


class NotFound(LookupError):
    def __init__(self, kind: str, ident: str) -> None:
        super().__init__(f"{kind} {ident!r} not found")
        self.kind = kind


class Conflict(ValueError):
    """A uniqueness or reference constraint would be broken."""
