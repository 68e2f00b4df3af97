"""A library user of the shared private server, driven line by line on stdin.

`python -m tests.shared_user <config>` opens `ConversationStore.from_config` and
answers one line per command: `record <uuid> <text>` -> `ok`, `context <uuid>`
-> a JSON list of contents, `server` -> the server's process ID, `close` ->
closes the store and exits. tests/test_shared_store.py runs several at once.
"""

from __future__ import annotations

import json
import sys

from gridmem import AvatarMessage
from gridmem import ConversationStore
from gridmem import Settings


def main() -> None:
    with ConversationStore.from_config(Settings.load(sys.argv[1])) as store:
        print("attached", flush=True)
        for line in sys.stdin:
            command, _, argument = line.strip().partition(" ")
            if command == "record":
                uuid, _, text = argument.partition(" ")
                store.record(uuid, "im", AvatarMessage(text=text))
                print("ok")
            elif command == "context":
                print(json.dumps([m.content for m in store.context(argument, "im")]))
            elif command == "server":
                print(store.redis.info("server")["process_id"])
            elif command == "close":
                break
            sys.stdout.flush()
    print("closed", flush=True)


if __name__ == "__main__":
    main()
