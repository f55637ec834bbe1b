package io.automq.tests;

import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * A transactional consume-transform-produce loop, as Kafka's exactly-once examples write it: each
 * polled batch's output and its consumer offsets commit in one transaction.
 *
 * <pre>TransformLoop BOOTSTRAP INPUT OUTPUT GROUP TRANSACTIONAL_ID [--exit-when-caught-up]</pre>
 *
 * The value is upper-cased; the key is kept. Prints "committed N" after each transaction (N the
 * records committed by this process so far) and "caught-up" once its position reaches the end
 * of every assigned partition, where it exits if asked to.
 */
public final class TransformLoop {
    public static void main(String[] args) {
        String bootstrap = args[0], input = args[1], output = args[2], group = args[3];
        String transactionalId = args[4];
        boolean exitWhenCaughtUp = List.of(args).contains("--exit-when-caught-up");

        Properties c = new Properties();
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        c.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        c.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        c.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        c.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "200");
        // a restarted loop gets the partitions of a killed one after 6 s, not the default 45
        c.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "6000");
        c.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "1000");
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());

        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());

        long committed = 0;
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(c);
             KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            producer.initTransactions();
            consumer.subscribe(List.of(input));
            while (true) {
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(200));
                if (records.isEmpty()) {
                    if (caughtUp(consumer)) {
                        System.out.println("caught-up " + committed);
                        System.out.flush();
                        if (exitWhenCaughtUp) {
                            return;
                        }
                    }
                    continue;
                }
                producer.beginTransaction();
                Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
                for (ConsumerRecord<String, String> r : records) {
                    producer.send(new ProducerRecord<>(output, r.key(), r.value().toUpperCase(Locale.ROOT)));
                    offsets.put(new TopicPartition(r.topic(), r.partition()), new OffsetAndMetadata(r.offset() + 1));
                }
                producer.sendOffsetsToTransaction(offsets, consumer.groupMetadata());
                producer.commitTransaction();
                committed += records.count();
                System.out.println("committed " + committed);
                System.out.flush();
            }
        }
    }

    private static boolean caughtUp(KafkaConsumer<String, String> consumer) {
        Set<TopicPartition> assigned = consumer.assignment();
        if (assigned.isEmpty()) {
            return false;
        }
        Map<TopicPartition, Long> ends = consumer.endOffsets(assigned);
        for (TopicPartition tp : assigned) {
            if (consumer.position(tp) < ends.get(tp)) {
                return false;
            }
        }
        return true;
    }
}
