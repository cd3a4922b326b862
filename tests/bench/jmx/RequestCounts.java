// The broker's request counts by API (kafka.network RequestMetrics RequestsPerSec, attribute Count),
// read over JMX from 127.0.0.1:PORT: `java RequestCounts.java PORT` prints "API COUNT" lines.
// Run as a single-file source program (Java 11+); tests/bench/broker_requests.py drives it.
import javax.management.*;
import javax.management.remote.*;
import java.util.*;
public class RequestCounts {
  public static void main(String[] a) throws Exception {
    JMXConnector c = JMXConnectorFactory.connect(new JMXServiceURL("service:jmx:rmi:///jndi/rmi://127.0.0.1:" + a[0] + "/jmxrmi"));
    MBeanServerConnection s = c.getMBeanServerConnection();
    Map<String, Long> counts = new TreeMap<>();
    for (ObjectName n : s.queryNames(new ObjectName("kafka.network:type=RequestMetrics,name=RequestsPerSec,*"), null)) {
      String req = n.getKeyProperty("request");
      long v = ((Number) s.getAttribute(n, "Count")).longValue();
      counts.merge(req, v, Long::sum);
    }
    for (var e : counts.entrySet()) if (e.getValue() > 0) System.out.println(e.getKey() + " " + e.getValue());
    c.close();
  }
}
