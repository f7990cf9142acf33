"""The one base error the CLI catches: a user's mistake that stops a command from running.

    LlmgwError              -> exit 2, its message printed as it is
      UsageError            a file, directory or setting that is missing or wrong
        FleetError          a fleet inventory that is missing or wrong, with its findings
      PlanError             a plan that cannot be read or does not validate
      PlanWriteError        the gateway accepted a plan but could not write it (gateway.reload)
      DeployRefused         the gateway answered a deploy, and said no (gitops.deploy)
      GiteaError            the pull-request comment could not be posted (gitea)
        ReadOnlyFork        a fork's read-only token: a warning, not a failed job
      NodeError             the node agent cannot run as asked (node.runner)
      WeightsError          a replica's weights cannot be had; the agent retries (node.weights)
      InspectError          a GGUF header cannot be fetched or read (gguf_header, fetch, inspect)
      ServiceError          what one request meets inside a running gateway or agent; answered
                            over HTTP or handed to another replica, never printed at a terminal
        Refusal             the agent will not lease an engine (node.leases): NotOnDemand 404,
                            NoRoom 409, EngineNotReady 503
        QueueFull           the key already has as many requests waiting as it may (schedule.store)
        AgentSilent         an on-demand replica's agent does not answer (request.lease)
        EngineFailed        an on-demand replica's engine failed to start (request.lease)
        AnswerCut           an engine's JSON answer ended early (request.relay)
        LookupFailed        a DNS name that lists replicas could not be looked up (state.discovery)

Findings (lint results) are not errors: they are collected and reported. The gateway's
answers to clients are not either: `gateway.errors.ApiError` is an HTTP response in
OpenAI's shape, never raised to a person at a terminal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmgw.findings import Finding


class LlmgwError(Exception):
    """A sentence to the person who must act; never a traceback."""


class UsageError(LlmgwError):
    pass


class FleetError(UsageError):
    """Carries its findings, so `lint --format json|github|markdown` can report them too:
    a pull request that breaks fleet.yaml must not get an empty lint section."""

    def __init__(self, message: str, findings: list[Finding]) -> None:
        super().__init__(message)
        self.findings = findings


class PlanError(LlmgwError):
    pass


class InspectError(LlmgwError):
    """The file is not a GGUF, its header is cut short, or the server would not give it."""


class ServiceError(LlmgwError):
    """What one request meets inside a running service, declined or cut short. The service answers it (an HTTP
    status, another replica's turn); a person at a terminal never sees it as an error."""
