"""Verify webhook deliveries with the Standard Webhooks reference library.

Reads one JSON object from stdin: {"secret": "whsec_...", "deliveries":
[{"headers": {...}, "body": "..."}]}. For each delivery prints one JSON line:
{"verified": true, "type": ...} when its signature verifies, or
{"verified": false, "error": ...} when the library rejects it.
"""

import json
import sys

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


def main() -> None:
    request = json.load(sys.stdin)
    hook = Webhook(request["secret"])
    for delivery in request["deliveries"]:
        try:
            payload = hook.verify(delivery["body"], delivery["headers"])
            print(json.dumps({"verified": True, "type": payload["type"]}))
        except WebhookVerificationError as e:
            print(json.dumps({"verified": False, "error": str(e)}))


if __name__ == "__main__":
    main()
