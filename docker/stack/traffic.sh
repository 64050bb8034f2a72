#!/bin/sh
# Demo traffic for the serving dashboard: classifies the synthetic validation images through the
# REST endpoint in a loop, and now and then sends a request the server must reject (a corrupt
# image, an unsupported media type, an unknown model), so every serving panel has something to show.
set -u
url="${GPUFEED_SERVER_URL:-http://server:8000}"
model="${GPUFEED_MODEL:-gpufeed}"
images="${GPUFEED_IMAGES:-/gpufeed/data/images/val}"
post() { curl -s -o /dev/null -w '%{http_code}\n' --max-time 30 "$@"; }
until curl -sf "$url/v2/health/ready" >/dev/null; do sleep 2; done
echo "traffic: $url is ready; sending images from $images"
round=0
while true; do
    for f in "$images"/*/*; do
        case "$f" in
            *.png) type=image/png ;;
            *) type=image/jpeg ;;
        esac
        post -H "Content-Type: $type" --data-binary "@$f" "$url/v1/models/$model/predict" >/dev/null
    done
    round=$((round + 1))
    if [ $((round % 5)) -eq 0 ]; then
        post -H "Content-Type: image/jpeg" --data-binary "not a jpeg" "$url/v1/models/$model/predict"
        post -H "Content-Type: text/plain" --data-binary "hello" "$url/v1/models/$model/predict"
        post -H "Content-Type: image/jpeg" --data-binary "@$f" "$url/v1/models/no-such-model/predict"
    fi
    sleep "${GPUFEED_TRAFFIC_PAUSE_SECONDS:-0.5}"
done
