"""`freshplan tokens init|rotate`: the freshness-token key file, made once; a new key, the old one accepted a while."""

from __future__ import annotations

import argparse
import math
import sys

from agents.cli.settings import _settings


def cmd_tokens_rotate(args: argparse.Namespace) -> int:
    """Add a new freshness-token key to the key file (FRESHPLAN_TOKEN_KEY_FILE, else token-keys.json in the state
    dir). Workers re-read the file every second: the new key is accepted at once and signs after --sign-after
    seconds; the old one is still accepted for --grace seconds after that, then dropped at the next rotation."""
    from agents.web.token_keys import TokenKeyError, rotate

    settings = _settings(args)
    path = settings.token_keys_path
    try:
        keys = rotate(path, grace=args.grace, sign_delay=args.sign_after)
    except TokenKeyError as exc:
        print(f"freshplan tokens rotate: {exc}", file=sys.stderr)
        return 2
    print(f"freshplan: {path} now holds {len(keys)} keys; the new one signs in {args.sign_after:g} s, the previous "
          f"ones are accepted for {args.grace:g} s more. Copy the file to every worker that does not share it.")
    return 0


def cmd_tokens_init(args: argparse.Namespace) -> int:
    """Make the token key file if it does not exist (what `freshplan run` does on first start), e.g. once on a
    volume that every worker of a group mounts; an existing file is checked and kept."""
    from agents.web.token_keys import TokenKeyError, TokenKeys

    path = _settings(args).token_keys_path
    try:
        keys = TokenKeys(path).ensure()
    except TokenKeyError as exc:
        print(f"freshplan tokens init: {exc}", file=sys.stderr)
        return 2
    print(f"freshplan: {path} holds {len(keys.keys)} keys")
    return 0


def _seconds(text: str) -> float:
    """A number of seconds, 0 or more and finite (argparse turns the ValueError into a usage error)."""
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(text)
    return value


def add_tokens_parser(sub) -> None:
    """Register `freshplan tokens rotate` on the CLI's subcommands."""
    tokens = sub.add_parser("tokens", help="the keys that sign freshness tokens")
    tokens_sub = tokens.add_subparsers(dest="tokens_command", required=True)
    rotate = tokens_sub.add_parser("rotate", help="add a new signing key; the old one stays accepted for a grace",
                                   description=cmd_tokens_rotate.__doc__)
    rotate.add_argument("--state-dir", help="state directory holding token-keys.json (default .freshplan)")
    rotate.add_argument("--grace", type=_seconds, default=86_400.0,
                        help="seconds the previous keys stay accepted once the new one signs (default 86400)")
    rotate.add_argument("--sign-after", dest="sign_after", type=_seconds, default=10.0,
                        help="seconds before the new key signs; every worker must have re-read the file by then "
                             "(default 10)")
    rotate.set_defaults(func=cmd_tokens_rotate)
    init = tokens_sub.add_parser("init", help="make the key file if it does not exist",
                                 description=cmd_tokens_init.__doc__)
    init.add_argument("--state-dir", help="state directory holding token-keys.json (default .freshplan)")
    init.set_defaults(func=cmd_tokens_init)
