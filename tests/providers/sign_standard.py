"""Signs a webhook body (stdin) with the official Standard Webhooks library and prints the
signature header's value. Usage: sign_standard.py SECRET MSG_ID UNIX_TIMESTAMP"""
import sys
from datetime import datetime, timezone

from standardwebhooks.webhooks import Webhook

secret, msg_id, timestamp = sys.argv[1], sys.argv[2], int(sys.argv[3])
body = sys.stdin.read()
when = datetime.fromtimestamp(timestamp, tz=timezone.utc)
sys.stdout.write(Webhook(secret).sign(msg_id, when, body))
