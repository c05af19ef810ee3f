#!/usr/bin/env python3
"""Structural check of a compose file, offline (no docker compose plugin here).

Checks what `docker compose config` would refuse, and what this deployment relies on:
only known top-level keys; every service has an image and known keys; every depends_on,
secret and volume it names is defined; every dlock service (image dlock) has a
healthcheck on /health/ready (C4 §4.6) unless it is a one-shot (restart "no").
Exit 0 when clean, 1 with one line per finding. Usage: check-compose.py FILE...
"""
import sys

import yaml

TOP = {"name", "services", "secrets", "volumes", "networks", "configs", "include"}
SERVICE = {
    "image", "build", "command", "entrypoint", "environment", "env_file", "secrets", "volumes",
    "depends_on", "healthcheck", "restart", "read_only", "user", "cap_drop", "security_opt",
    "stop_grace_period", "deploy", "profiles", "ports", "networks", "working_dir", "tmpfs",
    "labels", "hostname",
}
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}


def check(path):
    errors = []
    with open(path) as f:
        doc = yaml.safe_load(f)
    if not isinstance(doc, dict):
        return [f"{path}: not a mapping"]
    for key in doc:
        if key not in TOP and not str(key).startswith("x-"):
            errors.append(f"{path}: unknown top-level key {key!r}")
    services = doc.get("services") or {}
    secrets = doc.get("secrets") or {}
    volumes = doc.get("volumes") or {}
    if not services:
        errors.append(f"{path}: no services")
    for name, svc in services.items():
        where = f"{path}: service {name}"
        if not isinstance(svc, dict):
            errors.append(f"{where}: not a mapping")
            continue
        for key in svc:
            if key not in SERVICE:
                errors.append(f"{where}: unknown key {key!r}")
        if "image" not in svc and "build" not in svc:
            errors.append(f"{where}: neither image nor build")
        deps = svc.get("depends_on") or {}
        for dep in deps:
            if dep not in services:
                errors.append(f"{where}: depends_on unknown service {dep!r}")
            cond = deps[dep].get("condition") if isinstance(deps, dict) and isinstance(deps[dep], dict) else None
            if cond is not None and cond not in CONDITIONS:
                errors.append(f"{where}: unknown depends_on condition {cond!r}")
            if cond == "service_healthy" and dep in services and "healthcheck" not in services[dep]:
                errors.append(f"{where}: waits for {dep} to be healthy, which has no healthcheck")
        for s in svc.get("secrets") or []:
            s = s.get("source") if isinstance(s, dict) else s
            if s not in secrets:
                errors.append(f"{where}: unknown secret {s!r}")
        for v in svc.get("volumes") or []:
            src = str(v).split(":", 1)[0]
            if not src.startswith((".", "/")) and src not in volumes:
                errors.append(f"{where}: unknown volume {src!r}")
        env = svc.get("environment") or {}
        if not isinstance(env, dict):
            errors.append(f"{where}: environment must be a mapping")
        is_dlock = "dlock" in str(svc.get("image", ""))
        one_shot = str(svc.get("restart", "")) == "no"
        if is_dlock and not one_shot:
            test = " ".join(map(str, (svc.get("healthcheck") or {}).get("test") or []))
            if "/health/ready" not in test:
                errors.append(f"{where}: a dlock service needs a healthcheck on /health/ready (C4)")
        if is_dlock and str(env.get("DLOCK_PROFILE", "production")) != "production":
            errors.append(f"{where}: DLOCK_PROFILE must stay production")
    for name, sec in secrets.items():
        if not isinstance(sec, dict) or "file" not in sec:
            errors.append(f"{path}: secret {name} must come from a file (never inline)")
    return errors


def main(argv):
    if len(argv) < 2:
        print("usage: check-compose.py FILE...", file=sys.stderr)
        return 2
    errors = [e for p in argv[1:] for e in check(p)]
    for e in errors:
        print(e, file=sys.stderr)
    if not errors:
        print(f"check-compose: {len(argv) - 1} file(s) OK")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
