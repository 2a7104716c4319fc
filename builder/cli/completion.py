"""`trident completion bash|zsh|fish`: print the shell completion script.

The script calls trident back with `_TRIDENT_COMPLETE` set, which click's own completion
answers (see builder.cli.main).
"""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class

COMPLETE_VAR = "_TRIDENT_COMPLETE"
SHELLS = ("bash", "zsh", "fish")


@click.command()
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> int:
    """Print the completion script for SHELL.

    \b
    bash:  eval "$(trident completion bash)"   (in ~/.bashrc)
    zsh:   eval "$(trident completion zsh)"    (in ~/.zshrc)
    fish:  trident completion fish > ~/.config/fish/completions/trident.fish
    """
    ctx = click.get_current_context()
    root = ctx.find_root()
    shell_class = get_completion_class(shell)
    assert shell_class is not None  # click.Choice(SHELLS) let only click's own shells in
    complete = shell_class(root.command, {}, root.info_name or "trident", COMPLETE_VAR)
    click.echo(complete.source())
    return 0


COMMANDS = [completion]
