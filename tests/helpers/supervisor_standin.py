"""A stand-in for the two endpoints of Home Assistant's Supervisor an add-on uses, on loopback,
built like the Supervisor's own (aiohttp; supervisor/api/discovery.py and api/proxy.py), run
with Home Assistant's virtualenv's Python, which has aiohttp:

    python supervisor_standin.py --port P --token T --discovery wyoming --record FILE
        [--core ws://127.0.0.1:8123/api/websocket --core-token-file F]

- `POST /discovery`: the add-on's token in `Authorization: Bearer` (else 401); the body
  {"service": str, "config": dict}; a service the add-on does not list under `discovery` is
  refused (400, {"result": "error", "message": ...}); a wyoming config needs a tcp:// `uri`.
  Each accepted message is recorded, and answered {"result": "ok", "data": {"uuid": ...}}.
- `/core/websocket`: `auth_required`; the add-on's `auth` with its token gets `auth_ok` (any
  other, `auth_invalid`); then a connection to Home Assistant's own websocket API, authenticated
  with the Supervisor's token (here a long-lived one of an administrator), and every message
  passed both ways.

Every request is recorded as one JSON line in FILE: {"endpoint", "token_ok", ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from pathlib import Path
from urllib.parse import urlparse

from aiohttp import ClientSession, WSMsgType, web

AUTH_WAIT_S = 10  # as the Supervisor waits for an add-on's auth message


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--discovery", action="append", default=[])
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("--core")
    parser.add_argument("--core-token-file", type=Path)
    args = parser.parse_args()
    app = web.Application()
    app["args"] = args
    app.add_routes([web.post("/discovery", discovery), web.get("/core/websocket", websocket)])
    web.run_app(app, host="127.0.0.1", port=args.port, print=lambda *a: print("standin: listening", flush=True))


def record(request: web.Request, **fields) -> None:
    with request.app["args"].record.open("a", encoding="utf-8") as f:
        f.write(json.dumps(fields) + "\n")


def error(message: str, status: int = 400) -> web.Response:
    return web.json_response({"result": "error", "message": message}, status=status)


async def discovery(request: web.Request) -> web.Response:
    args = request.app["args"]
    token = request.headers.get("Authorization", "").split(" ")[-1]
    if token != args.token:
        record(request, endpoint="discovery", token_ok=False)
        return web.Response(status=401)
    try:
        body = await request.json()
    except ValueError:
        return error("Invalid json")
    if not (isinstance(body, dict) and isinstance(body.get("service"), str) and isinstance(body.get("config"), dict)):
        return error("expected {'service': str, 'config': dict}")
    if body["service"] not in args.discovery:
        return error("Add-ons must list services they provide via discovery in their config!")
    uri = body["config"].get("uri")
    if body["service"] == "wyoming" and not (isinstance(uri, str) and urlparse(uri).scheme == "tcp"):
        return error("invalid Wyoming Protocol URI")
    record(request, endpoint="discovery", token_ok=True, body=body)
    return web.json_response({"result": "ok", "data": {"uuid": uuid.uuid4().hex}})


async def websocket(request: web.Request) -> web.WebSocketResponse:
    args = request.app["args"]
    server = web.WebSocketResponse()
    await server.prepare(request)
    await server.send_json({"type": "auth_required", "ha_version": "standin"})
    try:
        auth = await server.receive_json(timeout=AUTH_WAIT_S)
    except (TimeoutError, ValueError, TypeError):
        return server
    token_ok = auth.get("access_token") == args.token
    record(request, endpoint="websocket", token_ok=token_ok)
    if not token_ok:
        await server.send_json({"type": "auth_invalid", "message": "Invalid access"})
        return server
    await server.send_json({"type": "auth_ok", "ha_version": "standin"})
    if args.core is None:  # no Home Assistant behind this one: the proxy closes, as on a failure
        await server.close()
        return server
    async with ClientSession() as session, session.ws_connect(args.core, max_msg_size=0) as core:
        if (await core.receive_json()).get("type") != "auth_required":
            return server
        await core.send_json({"type": "auth", "access_token": args.core_token_file.read_text().strip()})
        if (await core.receive_json()).get("type") != "auth_ok":
            record(request, endpoint="websocket", core_auth=False)
            return server
        await asyncio.gather(_pass(server, core), _pass(core, server))
    return server


async def _pass(source, target) -> None:
    async for message in source:
        if message.type == WSMsgType.TEXT:
            await target.send_str(message.data)
        elif message.type == WSMsgType.BINARY:
            await target.send_bytes(message.data)
        else:
            break
    await target.close()


if __name__ == "__main__":
    main()
