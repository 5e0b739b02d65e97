"""Verifies one received webhook with the official Standard Webhooks library.

Usage: verify_signature.py SECRET < request.json
where request.json is {"headers": {...}, "body": "..."}. Exits 0 when the signature
verifies (timestamp tolerance included), 1 otherwise.
"""
import json
import sys

from standardwebhooks.webhooks import Webhook

request = json.load(sys.stdin)
try:
    Webhook(sys.argv[1]).verify(request["body"], request["headers"])
except Exception as error:  # the library raises WebhookVerificationError
    print(f"verification failed: {error}", file=sys.stderr)
    sys.exit(1)
print("verified")
