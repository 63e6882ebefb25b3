"""anpred instrument (placeholder: being implemented)."""

from anpred.errors import AnpredError

HELP = "(not implemented yet)"


def add_arguments(parser):
    parser.add_argument("rest", nargs="*")


def main(args):
    raise AnpredError("'anpred instrument' is not implemented yet")
