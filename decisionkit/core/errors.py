"""A user's mistake, told apart from a bug of the package.

``UserError`` is the base of every error that a user's input causes and one line can explain: bad data
(``DataError``), a request's questions (``QuestionError``), a backbone that cannot be loaded (``BackboneError``), an
extra that is not installed (``MissingExtra``), an output folder that must not be written (``RunError``), a model
folder that is not one (``ModelFolderError``), a setting out of range. The command line prints such an error as one
line (``decisionkit: error: ...``) and exits with 2; anything else is a bug and shows its traceback.
``DECISIONKIT_DEBUG=1`` shows the traceback of a user's error too (``settings.debug()``).
"""

from __future__ import annotations


class UserError(Exception):
    """An error of the user's input: its message names the file, row, field or setting, and what was expected."""


class SettingError(UserError, ValueError):
    """An environment variable or option with a value decisionkit does not read."""


class RunError(UserError):
    """A training run that must not go ahead: its output folder holds someone else's files, another run holds it."""


class ModelFolderError(UserError, ValueError):
    """A folder given as a saved model that is not one this decisionkit reads."""


class MissingFile(UserError, FileNotFoundError):
    """A file or folder the user named that is not there (or is not what it must be: a model, a data file)."""


def one_line(err: BaseException) -> str:
    """An exception as one line: its type and its message, line breaks folded."""
    return f"{type(err).__name__}: {' '.join(str(err).split())}"
