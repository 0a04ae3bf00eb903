"""Reads a Cairn node's errors the way a Python user would: with grpcio and
the standard google.rpc.Status (grpcio-status, googleapis-common-protos),
and nothing of Cairn's code. Cairn's .proto files are its published
contract: the request stubs and Cairn's own detail messages are generated
from them here, at run time, with grpcio-tools.

Run by cli/tests/system/grpc_error_model.rs against a real cluster:

    python3 grpc_error_model.py PROTO_DIR LEADER FOLLOWER OPS_TOKEN READER_TOKEN ADMIN_TOKEN

It provokes one error per kind it can reach on a healthy cluster, decodes
`grpc-status-details-bin`, checks it, and prints `checked KIND` for each; it
exits non-zero on the first error that does not read as documented in the
cairn-proto crate's `error` module.
"""

import sys
import tempfile

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from grpc_tools import protoc

DOMAIN = "cairn.v1"
HISTORY_WRITES = 40  # more than the cluster's --history-changes-max
PAGE_SIZE_MAX = 7  # the cluster's list_page_size_max
# Written while a watch is not read: far more bytes than HTTP/2 flow control and the
# node's watch buffer (the cluster's watch_buffer_events) hold together.
BURST_WRITES = 200
BURST_VALUE_BYTES = 64 * 1024


def generate(proto_dir):
    """Generates Python modules of Cairn's protos into a temporary directory."""
    out = tempfile.mkdtemp(prefix="cairn-py-")
    files = ["cairn/v1/resource.proto", "cairn/v1/errors.proto", "cairn/v1/admin.proto"]
    well_known = protoc.__file__.rsplit("/", 1)[0] + "/_proto"
    args = ["protoc", f"-I{proto_dir}", f"-I{well_known}",
            f"--python_out={out}", f"--grpc_python_out={out}"] + files
    if protoc.main(args) != 0:
        sys.exit(f"protoc failed on {files}")
    sys.path.insert(0, out)


def fail(message):
    print(f"FAILED: {message}", flush=True)
    sys.exit(1)


def expect_error(kind, code, call):
    """Calls `call`, which must fail with `code`; returns (status, details by type name)."""
    try:
        call()
    except grpc.RpcError as e:
        if e.code() != code:
            fail(f"{kind}: expected {code}, got {e.code()}: {e.details()}")
        status = rpc_status.from_call(e)
        if status is None:
            fail(f"{kind}: no google.rpc.Status in grpc-status-details-bin ({e.details()})")
        if status.message != e.details():
            fail(f"{kind}: status message {status.message!r} != {e.details()!r}")
        details = {}
        for any_ in status.details:
            details[any_.TypeName()] = any_
        info_any = details.get("google.rpc.ErrorInfo")
        if info_any is None:
            fail(f"{kind}: no google.rpc.ErrorInfo among {list(details)}")
        info = error_details_pb2.ErrorInfo()
        info_any.Unpack(info)
        if info.domain != DOMAIN or info.reason != kind:
            fail(f"{kind}: ErrorInfo says {info.reason!r} in {info.domain!r}")
        if not status.message:
            fail(f"{kind}: empty status message")
        return status, details
    fail(f"{kind}: the call succeeded")


def unpack(kind, details, message_class):
    name = message_class.DESCRIPTOR.full_name
    any_ = details.get(name)
    if any_ is None:
        fail(f"{kind}: no {name} among {list(details)}")
    message = message_class()
    if not any_.Unpack(message):
        fail(f"{kind}: {name} does not unpack")
    return message


def main():
    proto_dir, leader, follower, ops_token, reader_token, admin_token = sys.argv[1:7]
    generate(proto_dir)
    from cairn.v1 import admin_pb2, admin_pb2_grpc, errors_pb2, resource_pb2, resource_pb2_grpc

    def resources(address):
        return resource_pb2_grpc.ResourceServiceStub(grpc.insecure_channel(address))

    def auth(token):
        return [("authorization", f"Bearer {token}")]

    ops = auth(ops_token)
    data = resources(leader)
    thing = resource_pb2.Type(group="demo", group_version="v1", kind="Thing")
    default = resource_pb2.Tenancy(partition="default", namespace="default")

    def ident(name, uid="u1", type_=thing):
        return resource_pb2.ID(name=name, uid=uid, type=type_, tenancy=default)

    def write(name, uid="u1", version="", owner=None):
        resource = resource_pb2.Resource(id=ident(name, uid), version=version, owner=owner)
        return data.Write(resource_pb2.WriteRequest(resource=resource), metadata=ops, timeout=10)

    def list_things(**fields):
        return data.List(resource_pb2.ListRequest(type=thing, tenancy=default, **fields),
                         metadata=ops, timeout=10)

    first = write("first").resource
    write("second")
    # A listing's next page, kept until the history has moved past its revision.
    early = list_things(limit=1)
    if len(early.resources) != 1 or not early.next_page_token:
        fail(f"a page of limit 1 of two Things: {early}")

    # INVALID_ARGUMENT: the message names the field, and so does BadRequest.
    status, details = expect_error(
        "INVALID_ARGUMENT", grpc.StatusCode.INVALID_ARGUMENT, lambda: write(""))
    if status.message != "resource.id.name: must not be empty":
        fail(f"INVALID_ARGUMENT: message {status.message!r} does not name the field")
    bad = unpack("INVALID_ARGUMENT", details, error_details_pb2.BadRequest)
    violation = bad.field_violations[0]
    if (violation.field, violation.description) != ("resource.id.name", "must not be empty"):
        fail(f"INVALID_ARGUMENT: field violation {violation}")
    print("checked INVALID_ARGUMENT", flush=True)

    expect_error("NOT_FOUND", grpc.StatusCode.NOT_FOUND, lambda: data.Read(
        resource_pb2.ReadRequest(id=ident("missing")), metadata=ops, timeout=10))
    print("checked NOT_FOUND", flush=True)

    expect_error("CAS_FAILURE", grpc.StatusCode.ABORTED,
                 lambda: write("first", version="no-such-version"))
    print("checked CAS_FAILURE", flush=True)

    expect_error("WRONG_UID", grpc.StatusCode.ALREADY_EXISTS,
                 lambda: write("first", uid="u2", version=first.version))
    print("checked WRONG_UID", flush=True)

    v2 = resource_pb2.Type(group="demo", group_version="v2", kind="Thing")
    _, details = expect_error("GROUP_VERSION_MISMATCH", grpc.StatusCode.OUT_OF_RANGE, lambda: data.Read(
        resource_pb2.ReadRequest(id=ident("first", type_=v2)), metadata=ops, timeout=10))
    mismatch = unpack("GROUP_VERSION_MISMATCH", details, errors_pb2.GroupVersionMismatchDetails)
    if mismatch.requested_type.group_version != "v2" or mismatch.stored.id.name != "first":
        fail(f"GROUP_VERSION_MISMATCH: details {mismatch}")
    print("checked GROUP_VERSION_MISMATCH", flush=True)

    for i in range(HISTORY_WRITES):
        write(f"filler-{i}", owner=first.id)
    _, details = expect_error("COMPACTED", grpc.StatusCode.OUT_OF_RANGE, lambda: data.Read(
        resource_pb2.ReadRequest(id=ident("first"), revision=1), metadata=ops, timeout=10))
    compacted = unpack("COMPACTED", details, errors_pb2.CompactedDetails)
    if compacted.oldest_retained_revision <= 1:
        fail(f"COMPACTED: details {compacted}")
    # The listing begun before the fillers can no longer be continued.
    _, details = expect_error("COMPACTED", grpc.StatusCode.OUT_OF_RANGE,
                              lambda: list_things(page_token=early.next_page_token))
    compacted = unpack("COMPACTED", details, errors_pb2.CompactedDetails)
    if compacted.oldest_retained_revision <= early.revision:
        fail(f"COMPACTED (a page token): details {compacted}")
    print("checked COMPACTED", flush=True)

    # A List is paged: follow next_page_token; every page holds at most the
    # cluster's list_page_size_max and reflects the first page's revision,
    # also after a write between pages.
    page = list_things()
    listing, revision = [], page.revision
    while True:
        if len(page.resources) > PAGE_SIZE_MAX or page.revision != revision:
            fail(f"PAGES: a page of {len(page.resources)} at revision {page.revision} "
                 f"in a listing at {revision}")
        listing += [r.id.name for r in page.resources]
        if not page.next_page_token:
            break
        if len(listing) == PAGE_SIZE_MAX:
            write("between-pages")
        page = list_things(page_token=page.next_page_token)
    expected = ["first", "second"] + [f"filler-{i}" for i in range(HISTORY_WRITES)]
    if sorted(listing) != sorted(expected):
        fail(f"PAGES: listed {listing}")
    print("checked PAGES", flush=True)

    # A page token that is not one: INVALID_ARGUMENT naming page_token.
    _, details = expect_error("INVALID_ARGUMENT", grpc.StatusCode.INVALID_ARGUMENT,
                              lambda: list_things(page_token="not-a-token"))
    violation = unpack("INVALID_ARGUMENT", details, error_details_pb2.BadRequest).field_violations[0]
    if violation.field != "page_token":
        fail(f"INVALID_ARGUMENT (a page token): field violation {violation}")
    print("checked INVALID_ARGUMENT page_token", flush=True)

    # ListByOwner is not paged: the cluster's list_results_max is smaller than
    # the fillers owned by `first`.
    _, details = expect_error("RESOURCE_EXHAUSTED", grpc.StatusCode.RESOURCE_EXHAUSTED, lambda: data.ListByOwner(
        resource_pb2.ListByOwnerRequest(owner=first.id), metadata=ops, timeout=10))
    exhausted = unpack("RESOURCE_EXHAUSTED", details, errors_pb2.ResourceExhaustedDetails)
    if exhausted.limit != "list_results_max" or exhausted.value == 0:
        fail(f"RESOURCE_EXHAUSTED: details {exhausted}")
    print("checked RESOURCE_EXHAUSTED", flush=True)

    expect_error("UNAUTHENTICATED", grpc.StatusCode.UNAUTHENTICATED, lambda: data.Read(
        resource_pb2.ReadRequest(id=ident("first")), timeout=10))
    print("checked UNAUTHENTICATED", flush=True)

    expect_error("PERMISSION_DENIED", grpc.StatusCode.PERMISSION_DENIED, lambda: data.Write(
        resource_pb2.WriteRequest(resource=resource_pb2.Resource(id=ident("by-reader"))),
        metadata=auth(reader_token), timeout=10))
    print("checked PERMISSION_DENIED", flush=True)

    # NOT_LEADER: a membership change asked of a follower names the leader.
    admin = admin_pb2_grpc.AdminServiceStub(grpc.insecure_channel(follower))
    _, details = expect_error("NOT_LEADER", grpc.StatusCode.UNAVAILABLE, lambda: admin.Promote(
        admin_pb2.PromoteRequest(id=1), metadata=auth(admin_token), timeout=10))
    hint = unpack("NOT_LEADER", details, errors_pb2.NotLeaderDetails)
    if hint.leader_client_address != leader or hint.leader_id == 0:
        fail(f"NOT_LEADER: hint {hint} does not name the leader at {leader}")
    print("checked NOT_LEADER", flush=True)

    # WATCH_CLOSED: a consumer that stops reading falls behind by more than the node
    # buffers for one watch; the watch is closed, and the consumer must list again.
    burst = resource_pb2.Type(group="demo", group_version="v1", kind="Burst")
    watch = data.WatchList(resource_pb2.WatchListRequest(type=burst, tenancy=default),
                           metadata=ops, timeout=120)
    value = any_pb2.Any(type_url="type.googleapis.com/demo.Blob", value=b"x" * BURST_VALUE_BYTES)
    for i in range(BURST_WRITES):
        resource = resource_pb2.Resource(id=ident(f"burst-{i}", type_=burst), data=value)
        data.Write(resource_pb2.WriteRequest(resource=resource), metadata=ops, timeout=10)

    def read_to_the_end():
        for _ in watch:
            pass

    expect_error("WATCH_CLOSED", grpc.StatusCode.ABORTED, read_to_the_end)
    print("checked WATCH_CLOSED", flush=True)


if __name__ == "__main__":
    main()
