"""The agent daemon's lean entry point: `python -m farm_agent --head HOST:PORT [--token-file F] --name N --state-dir D`.

`farm agent start --detach` runs the daemon through this, not through the `farm` CLI: the daemon lives for days on
someone's machine, and typer, rich and the CLI's other commands would stay resident in it for nothing.

`python -m farm_agent --probe --cpus N` prints this machine's hardware and backend offers as JSON and exits: the
daemon asks a child process for them, so that the backend modules (numpy; torch or coremltools where a backend
checks its device) load only in processes that run shards, never in the daemon.

`python -m farm_agent --csr KEY_FILE` makes a new private key for the node, writes it 0600 to KEY_FILE (the daemon's
state folder), and prints a certificate signing request for it as PEM: the daemon asks a child for them at Register,
so that `cryptography` never loads in the daemon (it would stay resident, ~15 MB, for nothing).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path


def probe(cpus: int) -> dict[str, object]:
    from farm_agent import backends
    from farm_agent.daemon.hardware import detect, nvidia_gpus

    hardware = detect()
    return {
        "hardware": hardware.model_dump(mode="json"),
        "offers": [o.model_dump(mode="json") for o in backends.offers(hardware, cpus)],
        "no_gpus_because": "" if hardware.gpus else nvidia_gpus()[1],
    }


def new_csr(key_path: Path) -> bytes:
    """Make the node's key (kept 0600 at `key_path`, never printed) and return a CSR for it."""
    from farm.local import write_private
    from farm.tls import new_node_key

    key_pem, csr_pem = new_node_key()
    write_private(key_path, key_pem)
    return csr_pem


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m farm_agent", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--probe", action="store_true", help="print the hardware and backend offers as JSON")
    parser.add_argument("--csr", type=Path, metavar="KEY_FILE",
                        help="write a new private key to KEY_FILE (0600) and print a CSR for it as PEM")
    parser.add_argument("--head", help="HOST:PORT of the head")
    parser.add_argument("--token", help="the join token (shows in `ps`: prefer --token-file)")
    parser.add_argument("--token-file", type=Path, help="a file holding the join token")
    parser.add_argument("--ca-hash", default="", help="sha256:<hex> of the head's CA certificate, to pin it")
    parser.add_argument("--insecure", action="store_true", help="a head started with --insecure: no TLS")
    parser.add_argument("--name", help="the node's name")
    parser.add_argument("--state-dir", type=Path, help="this agent's own folder (agents/NAME under Farm's state)")
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--max-foreign-cpu", type=float, default=90.0)
    parser.add_argument("--drain-grace-s", type=float, default=60.0)
    parser.add_argument("--busy-file", type=Path, default=None)
    parser.add_argument("--keep-warm-s", type=float, default=600.0)
    parser.add_argument("--backends", help="comma-separated backends to offer (default: all this machine runs)")
    parser.add_argument("--ray-user", default=None,
                        help="the user the node's Ray runs as ('': the agent's own; default: farm.ray_user.chosen)")
    parser.add_argument("--trusted", action="store_true",
                        help="the head operator's own machine: join the head's Ray too (needs --admin-token-file)")
    parser.add_argument("--admin-token-file", type=Path, default=None,
                        help="a file holding the head's API token, for a trusted node's Register (removed once read)")
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(probe(args.cpus)))
        return
    if args.csr:
        try:
            csr_pem = new_csr(args.csr)
        except OSError as exc:
            print(f"--csr {args.csr}: cannot write the key: {exc.strerror or exc}", file=sys.stderr)
            sys.exit(2)
        sys.stdout.write(csr_pem.decode())
        return
    if args.token_file and not args.token:
        args.token = args.token_file.read_text().strip()
    if not (args.head and args.name and args.state_dir):  # no token: a node that joined before (node.json)
        parser.error("--head, --name and --state-dir are required")

    from farm.ray_user import chosen as chosen_ray_user
    from farm_agent.daemon.main import serve
    from farm_agent.daemon.settings import AgentSettings

    admin_token = ""
    if args.admin_token_file:
        admin_token = args.admin_token_file.read_text().strip()
        args.admin_token_file.unlink()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(AgentSettings(trusted=args.trusted, admin_token=admin_token, head=args.head, token=args.token or "",
                        name=args.name, state_dir=args.state_dir,
                        cpus=args.cpus, ca_hash=args.ca_hash, insecure=args.insecure,
                        max_foreign_cpu=args.max_foreign_cpu, drain_grace_s=args.drain_grace_s,
                        busy_file=args.busy_file, keep_warm_s=args.keep_warm_s,
                        backends=frozenset(args.backends.split(",")) if args.backends else None,
                        ray_user=chosen_ray_user(args.ray_user)))


if __name__ == "__main__":
    main()
