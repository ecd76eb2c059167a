"""boto3 sessions for the AWS providers: the standard credential chain, never a key in our config or logs."""

from __future__ import annotations

from typing import Any

from hpresilience.errors import EnvironmentMissing


def aws_client(service: str, region: str, endpoint_url: str) -> Any:
    try:
        import boto3
    except ImportError:
        raise EnvironmentMissing("the AWS providers need boto3: pip install 'boto3>=1.28'") from None
    # Credentials come from boto3's chain (env, shared files, instance profile); we pass none ourselves.
    kwargs: dict[str, Any] = {}
    if region:
        kwargs["region_name"] = region
    if endpoint_url:
        kwargs["endpoint_url"] = endpoint_url
    return boto3.session.Session().client(service, **kwargs)


def error_text(err: Exception) -> str:
    """`Code: message` of a botocore ClientError, the plain text otherwise (no request, no headers)."""
    response = getattr(err, "response", None)
    if isinstance(response, dict):
        e = response.get("Error", {})
        return f"{e.get('Code', 'Error')}: {e.get('Message', '')}".strip()
    return str(err)
