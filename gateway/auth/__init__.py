"""Who is calling and what they may do: identities, API keys, JWTs, authentication, the
permission every route declares, and the audit trail of refusals and admin actions
(docs/security.md)."""

__all__: list[str] = []
