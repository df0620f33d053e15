"""Push writes' commands sent to Redis, and, when asked, confirmed by replicas.

Without write durability (the default) a write's commands go through redis-py's pipeline:
on one node one round trip, on Redis Cluster one per master, following redirects. With
``Durability(replicas=N)`` each master's share is followed by ``WAIT`` on the connection
that wrote it (``feature_store.sending.send_durable_async``); fewer replicas than asked
raise ``NotDurableError``, answered 503 ``not_durable`` (gRPC UNAVAILABLE).
"""

from __future__ import annotations

from collections.abc import Sequence

from feature_store.batch import Command
from feature_store.connection import AsyncClient, is_key_error, missing_script, translated_errors
from feature_store.durability import ASYNCHRONOUS, Durability
from feature_store.layout import with_script
from feature_store.sending import send_durable_async


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
            if self.durability.asked:
                result = await send_durable_async(self.client, commands, self.durability)
            else:
                result = await self._pipeline(commands)
                if missing := missing_script(result):
                    again = await self._pipeline([with_script(commands[i]) for i in missing])
                    for i, reply in zip(missing, again, strict=True):
                        result[i] = reply
            for reply in result:
                if isinstance(reply, Exception) and not is_key_error(reply):
                    raise reply
            return result

    async def _pipeline(self, commands: Sequence[Command]) -> list[object]:
        pipe = self.client.pipeline(transaction=False)
        for cmd in commands:
            pipe.execute_command(*cmd)
        result: list[object] = await pipe.execute(raise_on_error=False)
        return result
