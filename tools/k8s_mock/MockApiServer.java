// fabric8's in-memory Kubernetes API server in CRUD mode, for the Kubernetes backend's tests.
//
// A stand-in for the API, not a cluster: objects are stored and served back (create, get, list
// with label selectors, JSON merge / strategic / JSON patches, delete, watch), but no controller
// runs, so a Deployment's replicas never turn into pods by themselves and nothing is scheduled.
// Plain HTTP, no authentication. Prints "listening <url>" on its own line once it serves, then
// runs until its standard input closes (the test fixture's end) or it is killed.

import io.fabric8.kubernetes.client.server.mock.KubernetesCrudDispatcher;
import io.fabric8.kubernetes.client.server.mock.KubernetesMockServer;
import io.fabric8.mockwebserver.Context;
import io.fabric8.mockwebserver.MockWebServer;
import java.net.InetAddress;
import java.util.HashMap;

public final class MockApiServer {
    public static void main(String[] args) throws Exception {
        String host = args.length > 0 ? args[0] : "127.0.0.1";
        int port = args.length > 1 ? Integer.parseInt(args[1]) : 0;  // 0: a free port
        KubernetesMockServer server = new KubernetesMockServer(
                new Context(), new MockWebServer(), new HashMap<>(), new KubernetesCrudDispatcher(), false);
        server.init(InetAddress.getByName(host), port);
        System.out.println("listening " + server.url("/").replaceAll("/+$", ""));
        System.out.flush();
        while (System.in.read() != -1) {
            // the fixture never writes; EOF means it is done with us
        }
        server.destroy();
        System.exit(0);
    }
}
