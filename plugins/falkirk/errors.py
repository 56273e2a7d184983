"""The base of every error falkirk reports to a user.

Commands print these as one line naming the problem and where it came from, never a
traceback; anything else escaping is a bug.
"""


class FalkirkError(Exception):
    """Bad input, or a state that needs an operator: the message says what and where."""
