// The Kafka trials' feeder (bench/throughput/kafka_input.py starts it with `java -cp <the
// broker's jars> KafkaFeeder.java ...`): record v of the rate schedule goes to partition
// v % partitions as its offset v / partitions, its Kafka timestamp (CreateTime)
// origin + v * 1000 / rate, written no earlier than that time, until the process is stopped.
// The origin is the next whole second once its producer is ready, printed on stdout: a JVM
// compiling this file on a loaded machine starts in seconds, and its records would be late.
// In Java rather than Python because the feeder shares the cores with the system under test:
// the JVM's producer costs a fraction of confluent-kafka's per-record Python call.
//
// The record's line is textgen's (driver/dstream/worker/textgen.py): line_index(seed, p, n), a
// splitmix64 of the offset and partition, into the pool that the Python side writes to a file,
// one line each (Java's long arithmetic wraps as textgen's 64-bit masks do).

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class KafkaFeeder {
  public static void main(String[] args) throws Exception {
    String bootstrap = args[0], topic = args[1];
    long rate = Long.parseLong(args[2]);
    int partitions = Integer.parseInt(args[3]);
    long seed = Long.parseLong(args[4]);
    byte[][] pool = readPool(Path.of(args[5]));
    Properties config = new Properties();
    config.put("bootstrap.servers", bootstrap);
    config.put("enable.idempotence", "true"); // a retried send never shifts an offset
    config.put("linger.ms", "5");
    config.put("buffer.memory", String.valueOf(256L << 20));
    try (KafkaProducer<byte[], byte[]> producer =
        new KafkaProducer<>(config, new ByteArraySerializer(), new ByteArraySerializer())) {
      producer.partitionsFor(topic); // connected, the topic's metadata known
      long origin = (System.currentTimeMillis() / 1000 + 1) * 1000;
      System.out.println(origin);
      System.out.flush();
      long sent = 0;
      while (true) {
        long due = recordsBy(origin, rate, System.currentTimeMillis());
        for (long v = sent; v < due; v++) {
          int partition = (int) (v % partitions);
          long offset = v / partitions;
          byte[] line = pool[lineIndex(seed, partition, offset, pool.length)];
          long stamp = origin + v * 1000 / rate;
          producer.send(new ProducerRecord<>(topic, partition, stamp, null, line));
        }
        sent = Math.max(sent, due);
        Thread.sleep(5);
      }
    }
  }

  /** How many records have a timestamp at or before atMs (kafka_input.records_by). */
  static long recordsBy(long origin, long rate, long atMs) {
    long elapsed = atMs - origin;
    return elapsed < 0 ? 0 : ((elapsed + 1) * rate + 999) / 1000;
  }

  /** textgen.line_index: the pool size is a power of two, so the modulo is a mask. */
  static int lineIndex(long seed, int partition, long offset, int size) {
    long z = offset * 0x9E3779B97F4A7C15L + partition * 0xBF58476D1CE4E5B9L + seed;
    z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
    z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
    return (int) ((z ^ (z >>> 31)) & (size - 1));
  }

  static byte[][] readPool(Path file) throws Exception {
    List<String> lines = Files.readAllLines(file, StandardCharsets.UTF_8);
    byte[][] pool = new byte[lines.size()][];
    for (int i = 0; i < pool.length; i++) {
      pool[i] = lines.get(i).getBytes(StandardCharsets.UTF_8);
    }
    return pool;
  }
}
