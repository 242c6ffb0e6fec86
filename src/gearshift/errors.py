"""User-facing errors: each is shown as one line naming the field and what is allowed (exit code 2)."""


class UserError(ValueError):
    """Bad input from the user (config, spec, file, plan); never a bug."""


class ConfigError(UserError):
    """A job config field that is unknown, of the wrong type or out of range."""


class SpecError(UserError):
    """A cluster spec field that is missing or wrong."""


class PlanError(UserError):
    """A request that cannot be planned (more stages than layers, model does not fit, ...)."""


class ScheduleError(UserError):
    """A schedule (or a request for one) that is malformed, incomplete or deadlocks."""


class DataError(UserError):
    """A corpus or checkpoint that is missing, empty, corrupt or mismatched."""


class UsageError(UserError):
    """A command line that does not parse (unknown option, malformed value, an override without `=`)."""
