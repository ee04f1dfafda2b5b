"""The errors duly raises: one tree under `DulyError`, drawn in docs/architecture.md ("Errors").

Each class is also the builtin its contract names (a bad declaration is a ValueError, a
mistake in a call a TypeError). Messages are complete sentences that name the step or
workflow involved; a class docstring is the message when none is given.
"""

from __future__ import annotations


def first_line(said: object, fallback: str) -> str:
    """The first line of an error's text, or `fallback` when it has none: what a database
    said, without the statement and parameters SQLAlchemy writes below it."""
    return (str(said).splitlines() or [fallback])[0] if said is not None else fallback


class DulyError(Exception):
    """Something went wrong in duly."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or " ".join((self.__doc__ or "").split()))


class NotConnectedError(DulyError):
    """No workflow connection is active: enter connect_workflows(Session) or
    run_workflows(Session) first."""


class NotRunningError(DulyError):
    """No worker is running in this process: wake() needs an active run_workflows(Session)."""


class ConfigurationError(DulyError, ValueError):
    """A workflow, limit or worker is declared in a way duly cannot run."""


class NotAllowedError(DulyError, PermissionError):
    """The caller is known but may not do this: a role it lacks, or acting as someone else."""


class NotFoundError(DulyError, LookupError):
    """Something that was named does not exist."""


class StepError(DulyError, TypeError):
    """A step was used with arguments or a workflow it does not accept."""


class StepFailed(DulyError):
    """The step failed for good: raised by a step body, it stops the run without a retry."""


class StepTimeoutError(DulyError, TimeoutError):
    """A step ran past its timeout: its attempt was cancelled and counts as failed."""


class NotADirectiveError(DulyError, TypeError):
    """A step returned something that is not a directive."""


class EventError(DulyError, TypeError):
    """An event that cannot be published as given."""


class InvalidArgumentError(DulyError, ValueError):
    """A value was given that the call does not accept."""


class UnsupportedTypeError(DulyError, TypeError):
    """An object was given of a kind the call cannot use."""


class NotAWorkflowError(DulyError, TypeError):
    """The class is not a mapped workflow."""


class NotInStepError(DulyError, RuntimeError):
    """No step attempt is running: this call is for a step body."""


class RunBusyError(DulyError):
    """The run's step is running now: try again once it has committed."""


class WaitTimeoutError(DulyError, TimeoutError):
    """The run did not end within the wait; `run` is the run as it stood then."""

    def __init__(self, run: object = None, message: str | None = None) -> None:
        super().__init__(message)
        self.run = run


class BulkChangedError(DulyError):
    """What a bulk action was confirmed for has changed since its dry run: dry-run again."""


class InternalError(DulyError, RuntimeError):
    """Something duly relies on did not hold: this is a bug in duly."""


class ActionError(DulyError):
    """An action could not be registered, found or run."""


class ActionAlreadyRegisteredError(ActionError, ValueError):
    """An action with this name is already registered."""


class ActionNotFoundError(ActionError, NotFoundError):
    """No action is registered with this name."""


class ActionExecutionError(ActionError):
    """An action raised while it ran."""


class WorkflowExecutionError(DulyError):
    """An execution engine refused an operation on an execution."""

    def __init__(self, message: str | None = None, *, execution_id: str | None = None) -> None:
        super().__init__(message)
        self.execution_id = execution_id


class WorkflowExecutionNotFoundError(WorkflowExecutionError, NotFoundError):
    """No execution has this id."""


class InvalidWorkflowStateError(WorkflowExecutionError):
    """The execution is not in a state the operation is valid for."""

    def __init__(
        self,
        message: str | None = None,
        *,
        execution_id: str | None = None,
        operation: str = "",
        state: str = "",
        expected: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message, execution_id=execution_id)
        self.operation = operation
        self.state = state
        self.expected = expected


class WorkflowTransitionError(DulyError):
    """A graph workflow refused an action."""

    code = "WORKFLOW_TRANSITION_ERROR"


class StateWorkflowError(WorkflowTransitionError):
    """The graph workflow does not allow this action now."""

    code = "STATE_WORKFLOW_ERROR"


class WorkflowAlreadyCompletedError(WorkflowTransitionError):
    """The workflow instance has already ended."""

    code = "WORKFLOW_COMPLETED"


class WorkflowSubmissionError(WorkflowTransitionError):
    """The subject cannot be submitted: it already has an active workflow instance."""

    code = "SUBMISSION_ERROR"


class SelfApprovalError(WorkflowTransitionError, NotAllowedError):
    """The template forbids self-approval: who submitted the instance may not move or vote it."""

    code = "SELF_APPROVAL"


class TemplateNotActiveError(WorkflowTransitionError):
    """A submit named a version that is not its template's active one (a draft, an older or
    an invalid version): new instances start only on the active version."""

    code = "TEMPLATE_NOT_ACTIVE"


class SubmitterNotAllowedError(WorkflowTransitionError, NotAllowedError):
    """The template says who may submit, and the caller is not one of them."""

    code = "SUBMITTER_NOT_ALLOWED"


class AlreadyVotedError(WorkflowTransitionError):
    """The person has already voted at this state's visit: one vote each, never changed."""

    code = "ALREADY_VOTED"


class TemplateInvalidError(WorkflowTransitionError):
    """The template has validation errors and cannot be activated."""

    code = "TEMPLATE_INVALID"

    def __init__(self, message: str | None = None, *, errors: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.errors = errors
