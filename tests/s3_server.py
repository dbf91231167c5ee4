"""A real S3 server on loopback for tests: moto's server mode in a child process, with IAM
authentication ON (so SigV4 signatures are checked and wrong credentials are refused).

moto authenticates every request once ``INITIAL_NO_AUTH_ACTION_COUNT`` requests were served: the
first ones (made here, with boto3) create an IAM user, its access key, an allow-all S3 policy and
the bucket; every request after that, the proxy's included, must be signed with that key.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config as BotoConfig

SETUP_REQUESTS = 4  # create_user, create_access_key, put_user_policy, create_bucket
REGION = "us-east-1"
BUCKET = "context-proxy-test"

_SERVER = textwrap.dedent(
    """
    import sys, threading
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer
    server = ThreadedMotoServer("127.0.0.1", 0, verbose=False)
    server.start()
    print(server.get_host_and_port()[1], flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    server.stop()
    """
)


@dataclass
class S3Server:
    proc: subprocess.Popen[str]
    endpoint: str
    access_key_id: str
    secret_access_key: str

    def client(self) -> Any:
        """An out-of-band boto3 client (the operator's, or an attacker's with bucket access)."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            config=BotoConfig(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def start_s3_server() -> S3Server:
    env = {
        **os.environ,
        "INITIAL_NO_AUTH_ACTION_COUNT": str(SETUP_REQUESTS),
        "MOTO_ALLOW_NONEXISTENT_REGION": "true",
    }
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "HTTP_PROXY"):
        env.pop(name, None)
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    port = int(proc.stdout.readline().strip())
    endpoint = f"http://127.0.0.1:{port}"
    anonymous = {
        "endpoint_url": endpoint,
        "region_name": REGION,
        "aws_access_key_id": "AKIASETUPSETUPSETUP0",
        "aws_secret_access_key": "setup",
        "config": BotoConfig(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    }
    iam = boto3.client("iam", **anonymous)
    iam.create_user(UserName="context-proxy")
    key = iam.create_access_key(UserName="context-proxy")["AccessKey"]
    policy = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
    }
    iam.put_user_policy(
        UserName="context-proxy", PolicyName="s3", PolicyDocument=json.dumps(policy)
    )
    boto3.client("s3", **anonymous).create_bucket(Bucket=BUCKET)
    return S3Server(proc, endpoint, key["AccessKeyId"], key["SecretAccessKey"])
