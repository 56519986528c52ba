"""(being written)"""


def register_commands(subparsers):
    pass
