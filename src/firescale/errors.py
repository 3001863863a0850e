"""The one exception type whose message is meant for users."""


class FirescaleError(Exception):
    """A user-facing error: one sentence naming the file, key or record and what is allowed.

    The command line prints it without a traceback and exits non-zero.
    """
