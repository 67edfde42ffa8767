"""Errors shared by the runtime and the ahead-of-time side."""


class ArgumentError(ValueError, RuntimeError):
    """An argument aten refuses as well: a ValueError naming it, as every argument error of the
    product is, that is also the RuntimeError aten raises for it (shapes that do not match,
    dtypes it does not mix), so that code written against either catches it."""
