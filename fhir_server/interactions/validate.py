"""``$validate``: ``POST [base]/[type]/$validate`` and ``POST [base]/[type]/[id]/$validate``
(R4 operation Resource-validate).

The body is the resource itself, or a ``Parameters`` resource with the ``resource`` to
check and optionally ``mode`` (``create`` | ``update`` | ``delete``) and ``profile``. The
check is the full StructureDefinition validation (:mod:`fhir_server.conformance`): the
resource's type, the profiles it claims (``meta.profile``) and the ``profile`` asked for
(a profile the server does not know is an error), invariants, terminology, references
and the rules the specification states in prose, as the HL7 reference validator does.
Each issue names its location (``expression``) and the rule that failed
(``details.coding``: an invariant's key, or the validator's rule).

As the operation defines, a resource found invalid is a successful validation: 200 with
an OperationOutcome listing the issues (one ``information`` issue when there are none).
Only a request that cannot be validated is an error (400: no resource, an unknown mode;
404: ``mode=delete`` of an unknown resource). Nothing is stored.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.http import FhirResponse, check_format, read_json_body
from fhir_server.interactions.context import FhirContext
from fhir_server.outcome import FhirError, Issue, operation_outcome
from fhir_server.validation import check_shape, content_issues

MODES = ("create", "update", "delete")


async def validate(ctx: FhirContext, request: Request, resource_type: str,
                   resource_id: str | None = None) -> Response:
    check_format(request)
    ctx.service.check_type(resource_type)
    resource, mode, profiles = _arguments(await read_json_body(request), request)
    issues: list[Issue] = []
    if mode == "delete":
        if resource_id is None:
            raise FhirError.of(400, "required", "mode=delete needs the id in the URL "
                               f"([base]/{resource_type}/[id]/$validate)")
        await ctx.caller(request).read(resource_type, resource_id)  # 404/410/403 as a read
    else:
        if resource is None:
            raise FhirError.of(400, "required", "No resource to validate: send it as the "
                               "body or as the 'resource' parameter of a Parameters body")
        try:
            check_shape(resource, resource_type)
        except FhirError as exc:
            issues += exc.issues
        else:
            issues += await ctx.service.conformance.validate(resource, profiles, fresh=True)
            issues += content_issues(resource, resource_type)  # an added type's own rules
        issues += _mode_issues(resource, resource_type, resource_id, mode)
    if not any(issue.severity in ("error", "fatal") for issue in issues):
        checked = f" and {', '.join(profiles)}" if profiles else ""
        issues.insert(0, Issue("information", "informational",
                               f"No errors: the {resource_type} is valid FHIR R4{checked}"))
    return FhirResponse(operation_outcome(issues))


def _arguments(body: Any, request: Request) -> tuple[Any, str | None, list[str]]:
    """(resource, mode, profiles) from the body and the query string."""
    mode = request.query_params.get("mode")
    profiles = request.query_params.getlist("profile")
    resource = body
    if isinstance(body, dict) and body.get("resourceType") == "Parameters":
        resource = None
        for parameter in body.get("parameter") or []:
            if not isinstance(parameter, dict):
                continue
            name = parameter.get("name")
            if name == "resource":
                resource = parameter.get("resource")
            elif name == "mode":
                mode = parameter.get("valueCode") or parameter.get("valueString")
            elif name == "profile":
                profiles.append(str(parameter.get("valueUri") or parameter.get("valueCanonical")))
    if mode is not None and mode not in MODES:
        raise FhirError.of(400, "value", f"mode must be one of {', '.join(MODES)}, not {mode!r}",
                           "mode")
    return resource, mode, profiles


def _mode_issues(resource: Any, resource_type: str, resource_id: str | None,
                 mode: str | None) -> list[Issue]:
    """What an update needs beyond a valid resource: its id, the URL's id."""
    if mode != "update" or not isinstance(resource, dict):
        return []
    given = resource.get("id")
    if given is None:
        return [Issue("error", "required", f"{resource_type}.id: an update needs the id",
                      (f"{resource_type}.id",))]
    if resource_id is not None and given != resource_id:
        return [Issue("error", "invalid", f"{resource_type}.id: {given!r} is not the id in "
                      f"the URL ({resource_id!r})", (f"{resource_type}.id",))]
    return []
