"""Which TCP ports a process tree listens on beyond loopback (a local Ray must open none)."""

import ipaddress

import psutil


def non_loopback_listeners(root_pid: int) -> set[tuple[str, int, str]]:
    try:
        root = psutil.Process(root_pid)
        tree = {root.pid: root.name()} | {p.pid: p.name() for p in root.children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()
    found = set()
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in tree and not _is_loopback(conn.laddr.ip):
            found.add((conn.laddr.ip, conn.laddr.port, tree[conn.pid]))
    return found


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback
