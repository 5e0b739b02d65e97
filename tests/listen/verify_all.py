"""Verifies every request a receiver answered 2xx with the official Standard Webhooks
library. Usage: verify_all.py SECRET LOG; prints how many verified, exits 1 on the first that
does not."""

import json
import sys

from standardwebhooks.webhooks import Webhook

hook = Webhook(sys.argv[1])
n = 0
with open(sys.argv[2]) as f:
    for line in f:
        request = json.loads(line)
        if request["status"] // 100 != 2:
            continue
        headers = {k.lower(): v for k, v in request["headers"].items()}
        hook.verify(request["body"], headers)
        n += 1
print(n)
