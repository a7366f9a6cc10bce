"""Exceptions of attnc."""


class AttncSyntaxError(ValueError):
    """A `.attn` file that does not parse or describes an invalid variant.

    ``str(e)`` is the full diagnostic (``file:line:col``, the source line and a caret);
    the attributes say where.
    """

    def __init__(self, rendered, file, line, column, message, source_line):
        super().__init__(rendered)
        self.file = file
        self.line = line
        self.column = column
        self.message = message
        self.source_line = source_line
