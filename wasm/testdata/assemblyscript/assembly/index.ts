// A small proxy-wasm HTTP filter written with @solo-io/proxy-runtime: a wasmesh test
// fixture proving the wazero host runs guests from an SDK other than Go.
//
//   request headers:  adds "x-as-filter: <plugin configuration>", counts the request in
//                     the counter "as_filter_requests", logs one info line, and answers
//                     403 "denied by assemblyscript" when ":path" is "/as-deny".
//   response headers: adds "x-as-root-id: <plugin root id>".
export * from "@solo-io/proxy-runtime/proxy"; // the proxy_* exports, malloc and free
import {
  RootContext, Context, registerRootContext, FilterHeadersStatusValues, stream_context,
  Counter, log, LogLevelValues, send_local_response, GrpcStatusValues, HeaderPair,
} from "@solo-io/proxy-runtime";
import { get_buffer_bytes, get_property, BufferTypeValues } from "@solo-io/proxy-runtime/runtime";

const ROOT_ID = "as_filter";

class AsFilterRoot extends RootContext {
  config: string = "";
  rootId: string = "";
  requests: Counter | null = null;

  // RootContext.onConfigure in proxy-runtime 0.1.8 passes the configuration size where
  // proxy_get_buffer_bytes expects a pointer for the returned size, so the host would
  // write into guest memory at that address. Read the configuration here instead.
  onConfigure(configuration_size: u32): bool {
    if (configuration_size > 0) {
      this.config = String.UTF8.decode(
        get_buffer_bytes(BufferTypeValues.PluginConfiguration, 0, configuration_size));
    }
    this.rootId = String.UTF8.decode(get_property("plugin_root_id"));
    if (this.requests == null) {
      this.requests = new Counter("as_filter_requests");
    }
    return true;
  }

  createContext(context_id: u32): Context {
    return new AsFilter(context_id, this);
  }
}

class AsFilter extends Context {
  root: AsFilterRoot;

  constructor(context_id: u32, root_context: AsFilterRoot) {
    super(context_id, root_context);
    this.root = root_context;
  }

  onRequestHeaders(headers: u32, end_of_stream: bool): FilterHeadersStatusValues {
    const path = stream_context.headers.request.get(":path");
    const requests = this.root.requests;
    if (requests != null) requests.increment(1);
    log(LogLevelValues.info, "as_filter: request " + path);
    stream_context.headers.request.add("x-as-filter", this.root.config);
    if (path == "/as-deny") {
      send_local_response(403, "as_filter_denied", String.UTF8.encode("denied by assemblyscript"),
        new Array<HeaderPair>(), GrpcStatusValues.InvalidCode);
      return FilterHeadersStatusValues.StopIteration;
    }
    return FilterHeadersStatusValues.Continue;
  }

  onResponseHeaders(headers: u32, end_of_stream: bool): FilterHeadersStatusValues {
    stream_context.headers.response.add("x-as-root-id", this.root.rootId);
    return FilterHeadersStatusValues.Continue;
  }
}

registerRootContext((context_id: u32): RootContext => new AsFilterRoot(context_id), ROOT_ID);
