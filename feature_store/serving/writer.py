"""Push writes' commands sent to Redis, and, when asked, confirmed by replicas.

A write's commands go packed on one connection per master (``feature_store.sending.
send_async``): one round trip on one node, one per master on Redis Cluster, sent again
with the layout learnt after a slot moved or a master's connection failed, never after a
timeout (one timeout is what a hung Redis costs a push write). With
``Durability(replicas=N)`` each master's share is followed by ``WAIT`` on the connection
that wrote it; fewer replicas than asked raise ``NotDurableError``, answered 503
``not_durable`` (gRPC UNAVAILABLE).
"""

from __future__ import annotations

from feature_store.batch import Command
from feature_store.connection import AsyncClient, is_key_error, translated_errors
from feature_store.durability import ASYNCHRONOUS, Durability
from feature_store.sending import send_async


class Writer:
    """Runs write commands through the store client's connections, errors translated."""

    def __init__(self, client: AsyncClient, durability: Durability = ASYNCHRONOUS) -> None:
        self.client = client
        self.durability = durability

    async def run(self, commands: list[Command]) -> list[object]:
        """Each command's reply, an error reply (WRONGTYPE) in its place; raises StoreError
        when Redis fails or refuses for another reason than one key's data, and
        NotDurableError when fewer replicas than asked confirmed the write. The write
        script's text goes with the commands where Redis lost it (a restart, SCRIPT FLUSH)."""
        with translated_errors():
            result = await send_async(self.client, commands, self.durability)
            for reply in result:
                if isinstance(reply, Exception) and not is_key_error(reply):
                    raise reply
            return result
