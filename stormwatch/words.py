"""Counted nouns in messages (``1 rank``, ``4 ranks``, ``2 processes``): one home for the
CLI's, the lab's and the experiment checks' wording."""

from __future__ import annotations


def plural(count: int, word: str, many: str | None = None) -> str:
    """``count`` and ``word``: ``1 rollback``, ``2 rollbacks``; ``many`` is the plural when
    it is not ``word`` + ``s`` (``plural(2, "process", "processes")``)."""
    return f"{count} {word}" if count == 1 else f"{count} {many or word + 's'}"


__all__ = ["plural"]
