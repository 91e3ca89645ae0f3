package dev.millrace.bench;

import java.lang.management.ManagementFactory;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;
import java.util.stream.Collectors;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ListOffsetsOptions;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.CloseOptions;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;

/**
 * The Kafka Streams side of millrace-bench's comparison: input -> output pass-through.
 *
 * <p>Run: {@code java -cp 'target/streams-peer.jar:target/lib/*' dev.millrace.bench.StreamsPeer
 * --bootstrap 127.0.0.1:9092 --input IN --output OUT --records N --guarantee exactly_once_v2
 * --commit-interval-ms 100 --threads 2 --warmup-records 200000}. It prints one line:
 *
 * <pre>STREAMS records=N elapsed_s=.. first_record_s=.. cpu_s=.. warm_records=.. warm_elapsed_s=..
 * warm_cpu_s=.. rps=.. guarantee=.. threads=.. linger_ms=.. batch_size=..</pre>
 *
 * <p>The clock starts just before {@code KafkaStreams.start()} (group join and the first fetch are timed, as
 * for the Rust sides) and stops when all N outputs are visible: acknowledged (the output topic's end
 * offsets, for at_least_once) or committed (its last stable offsets, read_committed, for exactly_once_v2).
 * {@code cpu_s} is this JVM's CPU time over the same interval (OperatingSystemMXBean: every thread,
 * JIT and GC included), so JVM start-up and shutdown are not in it; the harness also takes the whole
 * process's CPU from getrusage when it reaps it.
 *
 * <p>The warm window leaves the JIT's warm-up out: it starts when the topology has seen
 * {@code --warmup-records} records and ends with the whole run, and {@code warm_*} are its records
 * (the rest), wall-clock and CPU seconds.
 *
 * <p>Settings: {@code --threads} stream threads (default: one per core), the producer's
 * {@code linger.ms} 5 (Millrace's) and {@code batch.size} 256 KiB (librdkafka batches up to 1 MB; the
 * Java producer's default is 16 KiB), the given commit interval; everything else Kafka Streams'
 * defaults.
 */
public final class StreamsPeer {
  /** The producer's linger.ms: Millrace's. */
  private static final int LINGER_MS = 5;
  /** The producer's batch.size. */
  private static final int BATCH_SIZE = 256 * 1024;

  private StreamsPeer() {}

  public static void main(String[] argv) throws Exception {
    Map<String, String> args = parse(argv);
    String bootstrap = args.getOrDefault("bootstrap", "127.0.0.1:9092");
    String input = required(args, "input");
    String output = required(args, "output");
    long records = Long.parseLong(required(args, "records"));
    String guarantee = args.getOrDefault("guarantee", StreamsConfig.AT_LEAST_ONCE);
    long commitMs = Long.parseLong(args.getOrDefault("commit-interval-ms", "1000"));
    long timeoutMs = Long.parseLong(args.getOrDefault("timeout-s", "600")) * 1000;
    String appId = args.getOrDefault("application-id", "millrace-bench-streams-" + System.nanoTime());
    int threads = Integer.parseInt(
        args.getOrDefault("threads", Integer.toString(Runtime.getRuntime().availableProcessors())));
    long warmup = Long.parseLong(args.getOrDefault("warmup-records", "0"));
    if (warmup < 0 || warmup >= records) {
      fail("--warmup-records must be at least 0 and below --records");
    }
    Path stateDir = Files.createTempDirectory("millrace-bench-streams");

    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
    props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, commitMs);
    props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, threads);
    props.put(StreamsConfig.producerPrefix(ProducerConfig.LINGER_MS_CONFIG), LINGER_MS);
    props.put(StreamsConfig.producerPrefix(ProducerConfig.BATCH_SIZE_CONFIG), BATCH_SIZE);
    props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.toString());
    props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");

    AtomicLong seen = new AtomicLong();
    AtomicLong firstNanos = new AtomicLong();
    com.sun.management.OperatingSystemMXBean os =
        (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
    // The warm window's start: taken by the stream thread that sees record number `warmup`.
    AtomicLong warmNanos = new AtomicLong();
    AtomicLong warmCpu = new AtomicLong();
    StreamsBuilder builder = new StreamsBuilder();
    builder.stream(input, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
        .peek((k, v) -> {
          long n = seen.getAndIncrement();
          if (n == 0) {
            firstNanos.set(System.nanoTime());
          }
          if (n == warmup) {
            warmCpu.set(os.getProcessCpuTime());
            warmNanos.set(System.nanoTime());
          }
        })
        .to(output, Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));

    Properties adminProps = new Properties();
    adminProps.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    boolean eos = !guarantee.equals(StreamsConfig.AT_LEAST_ONCE);
    try (Admin admin = Admin.create(adminProps)) {
      List<TopicPartition> outputs = admin.describeTopics(List.of(output)).allTopicNames().get().get(output)
          .partitions().stream().map(p -> new TopicPartition(output, p.partition())).collect(Collectors.toList());
      ListOffsetsOptions isolation =
          new ListOffsetsOptions(eos ? IsolationLevel.READ_COMMITTED : IsolationLevel.READ_UNCOMMITTED);
      Map<TopicPartition, OffsetSpec> latest =
          outputs.stream().collect(Collectors.toMap(tp -> tp, tp -> OffsetSpec.latest()));

      KafkaStreams streams = new KafkaStreams(builder.build(), props);
      long cpu0 = os.getProcessCpuTime();
      long t0 = System.nanoTime();
      streams.start();
      long deadline = t0 + timeoutMs * 1_000_000L;
      // Processed: every record went through the topology. Cheap to check, so checked often.
      while (seen.get() < records) {
        check(deadline, streams, "processed " + seen.get() + " of " + records);
        Thread.sleep(2);
      }
      // Visible: every output acknowledged (alos) or committed (eos). A few admin round trips.
      while (visible(admin, latest, isolation) < records) {
        check(deadline, streams, "outputs not all visible");
        Thread.sleep(2);
      }
      long t1 = System.nanoTime();
      long cpu1 = os.getProcessCpuTime();
      double elapsed = (t1 - t0) / 1e9;
      System.out.printf(
          "STREAMS records=%d elapsed_s=%.6f first_record_s=%.6f cpu_s=%.6f warm_records=%d warm_elapsed_s=%.6f"
              + " warm_cpu_s=%.6f rps=%.0f guarantee=%s commit_interval_ms=%d threads=%d linger_ms=%d"
              + " batch_size=%d seen=%d%n",
          records, elapsed, (firstNanos.get() - t0) / 1e9, (cpu1 - cpu0) / 1e9, records - warmup,
          (t1 - warmNanos.get()) / 1e9, (cpu1 - warmCpu.get()) / 1e9, records / elapsed, guarantee, commitMs,
          threads, LINGER_MS, BATCH_SIZE, seen.get());
      System.out.flush();
      // Leave the group now (Streams stays a member until the session times out otherwise), so that the
      // harness can delete the group right away.
      streams.close(CloseOptions.groupMembershipOperation(CloseOptions.GroupMembershipOperation.LEAVE_GROUP)
          .withTimeout(Duration.ofSeconds(30)));
      streams.cleanUp();
    }
  }

  private static long visible(Admin admin, Map<TopicPartition, OffsetSpec> latest, ListOffsetsOptions isolation)
      throws Exception {
    return admin.listOffsets(latest, isolation).all().get().values().stream().mapToLong(i -> i.offset()).sum();
  }

  private static void check(long deadline, KafkaStreams streams, String what) {
    KafkaStreams.State state = streams.state();
    if (state == KafkaStreams.State.ERROR || state == KafkaStreams.State.NOT_RUNNING) {
      fail("Kafka Streams stopped (" + state + "): " + what);
    }
    if (System.nanoTime() > deadline) {
      fail("timed out: " + what);
    }
  }

  private static void fail(String message) {
    System.err.println("streams-peer: " + message);
    System.exit(1);
  }

  private static String required(Map<String, String> args, String name) {
    String v = args.get(name);
    if (v == null) {
      fail("--" + name + " is required");
    }
    return v;
  }

  private static Map<String, String> parse(String[] argv) {
    Map<String, String> args = new HashMap<>();
    for (int i = 0; i < argv.length; i++) {
      if (!argv[i].startsWith("--") || i + 1 >= argv.length) {
        fail("arguments are --name value pairs; got " + argv[i]);
      }
      args.put(argv[i].substring(2), argv[++i]);
    }
    return args;
  }
}
